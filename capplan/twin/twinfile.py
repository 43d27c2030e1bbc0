"""twin.yaml: write a Twin for people (value, unit, source, how, 95 % interval of every
parameter) and read it back, edits included. Format: docs/twin.md "twin.yaml".

Every parameter is a mapping with ``value`` (the only field the simulation reads; edit it to
change the twin), ``unit``, ``source`` (estimated | default | manifest | lower bound),
``how`` and, where estimated, ``ci95`` and ``fitted`` (the value the fit gave: an edited value
is reported as such wherever the twin is used). A bare number instead of the mapping is
accepted too.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import yaml

from ..errors import SpecError
from ..io import write_text_atomic
from ..sim.config import ArrivalSpec, Tenant
from ..sim.lengths import LengthDist
from .model import Twin
from .params import EDITED, PARAM_KEYS, DecodePoint, Param, Workload
from .. import spec as S

FORMAT = "capplan-twin/1"
TOP = ("format", "name", "fitted_from", "warning", "notes", "parameters", "decode_step_ms", "workload",
       "last_check")
PARAM_FIELDS = ("value", "unit", "source", "how", "ci95", "fitted")
#: parameters added after capplan-twin/1 was first written: older files get these defaults
OPTIONAL_PARAMS = {"prefill_jitter_cv": 0.0, "decode_noise_cv": 0.0}


def _clean(v):
    """Plain YAML types: numpy scalars to Python, floats rounded to 6 decimals, tuples to lists."""
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    if hasattr(v, "item") and not isinstance(v, (str, bytes)):
        v = v.item()
    if isinstance(v, float):
        return round(v, 6) if v == v else None
    return v


def twin_to_dict(tw: Twin) -> dict:
    params = {}
    for p in tw.params:
        e = {"value": _clean(p.value), "unit": p.unit, "source": p.source, "how": p.how}
        if p.ci95 is not None:
            e["ci95"] = [_clean(p.ci95[0]), _clean(p.ci95[1])]
        e["fitted"] = _clean(p.fitted if p.fitted is not None else p.value)
        params[p.key] = e
    points = {}
    for d in tw.decode:
        e = {"value": _clean(d.ms)}
        if d.ci95 is not None:
            e["ci95"] = [_clean(d.ci95[0]), _clean(d.ci95[1])]
        e["fitted"] = _clean(d.fitted if d.fitted is not None else d.ms)
        points[int(d.batch)] = e
    wl = tw.workload
    arrival = {"process": wl.arrival.process}
    if wl.arrival.process == "gamma":
        arrival["cv"] = _clean(wl.arrival.cv)
    if wl.arrival.process == "replay":
        arrival.update({"path": wl.arrival.path, "format": wl.arrival.format})
    out = {
        "format": FORMAT,
        "name": tw.name,
        "fitted_from": tw.source,
        "warning": tw.warning or None,
        "notes": list(tw.notes),
        "parameters": params,
        "decode_step_ms": {"unit": "ms per decode step, by sequences in the batch (linear between points)",
                           "how": tw.decode_how, "points": points,
                           "measured": [[b, round(m, 4), c] for b, m, c in tw.measured_decode]},
        "workload": {
            "how": wl.how,
            "arrival": arrival,
            "lengths": wl.lengths.to_dict(),
            "tenants": [{"name": t.name, "share": _clean(t.share), "slo_class": t.slo_class,
                         **({"lengths": t.lengths.to_dict()} if t.lengths else {})} for t in wl.tenants],
            "runs": [dict(r) for r in wl.per_run],
        },
        "last_check": tw.last_check,
    }
    return _clean(out)


def twin_to_yaml(tw: Twin) -> str:
    head = ("# capplan twin — a calibrated model of a measured serving system (docs/twin.md).\n"
            "# Edit a parameter's `value` to change the twin; `fitted` then keeps what the fit gave.\n")
    return head + yaml.safe_dump(twin_to_dict(tw), sort_keys=False, allow_unicode=True, width=110,
                                 default_flow_style=None)


def write_twin(tw: Twin, path: str | os.PathLike) -> Path:
    return write_text_atomic(path, twin_to_yaml(tw))


def _param(key: str, raw, fld: str) -> Param:
    unit, _ = PARAM_KEYS[key]
    if not isinstance(raw, dict):
        raw = {"value": raw, "source": EDITED}
    raw = S.mapping(raw, fld, known=PARAM_FIELDS)
    if "value" not in raw:
        raise SpecError(f"{fld} needs a value", field=f"{fld}.value")
    v = raw["value"]
    if key == "router":
        v = S.choice(v, f"{fld}.value", ("least-outstanding-work",))
    elif key == "prefill_mode":
        v = S.choice(v, f"{fld}.value", ("mixed", "separate"))
    elif key in ("prefill_lanes", "queue_limit"):
        v = S.number(v, f"{fld}.value", integer=True, minimum=0 if key == "queue_limit" else 1, optional=True)
    elif key in ("replicas", "token_budget", "max_batch", "kv_capacity_tokens", "kv_block_size", "max_model_len"):
        v = S.number(v, f"{fld}.value", integer=True, minimum=1)
    elif key in ("error_share", "stall_share"):
        v = S.number(v, f"{fld}.value", minimum=0.0, maximum=0.99)
    elif key == "prefill_jitter_cv":
        v = S.number(v, f"{fld}.value", minimum=0.0, maximum=5.0)
    elif key == "kv_watermark":
        v = S.number(v, f"{fld}.value", minimum=0.0, maximum=0.49)
    elif key == "client_timeout_s":
        v = S.number(v, f"{fld}.value", above=0.0)
    else:
        v = S.number(v, f"{fld}.value", minimum=0.0)
    ci = raw.get("ci95")
    if ci is not None:
        if not (isinstance(ci, list) and len(ci) == 2):
            raise SpecError(f"{fld}.ci95 must be [low, high]", field=f"{fld}.ci95")
        ci = (S.number(ci[0], f"{fld}.ci95"), S.number(ci[1], f"{fld}.ci95"))
    fitted = raw.get("fitted", v)
    return Param(key, v, str(raw.get("unit", unit) or unit), str(raw.get("source", "")), str(raw.get("how", "") or ""),
                 ci, fitted)


def twin_from_dict(raw: dict) -> Twin:
    d = S.mapping(raw, "", known=TOP, what="twin file", optional=False)
    fmt = d.get("format", FORMAT)
    if fmt != FORMAT:
        raise SpecError(f"unknown twin format {fmt!r}", field="format", fix=f"this capplan reads {FORMAT}")
    pr = S.mapping(d.get("parameters"), "parameters")
    pr = {**{k: {"value": v, "source": "default", "how": "not in this twin file: default"}
             for k, v in OPTIONAL_PARAMS.items() if k not in pr}, **pr}
    missing = [k for k in PARAM_KEYS if k not in pr]
    if missing:
        raise SpecError(f"parameters lack {', '.join(missing)}", field="parameters",
                        fix="write a twin with `capplan twin fit` and edit it")
    unknown = sorted(set(pr) - set(PARAM_KEYS))
    if unknown:
        raise SpecError(f"unknown parameter(s): {', '.join(unknown)}", field="parameters",
                        fix="known: " + ", ".join(PARAM_KEYS))
    params = tuple(_param(k, pr[k], f"parameters.{k}") for k in PARAM_KEYS)
    ds = S.mapping(d.get("decode_step_ms"), "decode_step_ms", known=("unit", "how", "points", "measured"))
    pts_raw = S.mapping(ds.get("points"), "decode_step_ms.points")
    if not pts_raw:
        raise SpecError("decode_step_ms.points is empty", field="decode_step_ms.points",
                        fix="e.g. points: {1: {value: 29.4}, 64: {value: 52.0}}")
    points = []
    for b, e in pts_raw.items():
        fld = f"decode_step_ms.points.{b}"
        batch = S.number(b, fld, integer=True, minimum=1)
        if not isinstance(e, dict):
            e = {"value": e}
        e = S.mapping(e, fld, known=("value", "ci95", "fitted"))
        ms = S.number(e.get("value"), f"{fld}.value", above=0.0)
        ci = e.get("ci95")
        ci = (S.number(ci[0], f"{fld}.ci95"), S.number(ci[1], f"{fld}.ci95")) if isinstance(ci, list) and len(ci) == 2 else None
        points.append(DecodePoint(batch, ms, ci, S.number(e.get("fitted", ms), f"{fld}.fitted")))
    points.sort(key=lambda p: p.batch)
    if len({p.batch for p in points}) != len(points):
        raise SpecError("decode_step_ms.points has a batch size twice", field="decode_step_ms.points")
    measured = tuple((int(x[0]), float(x[1]), int(x[2])) for x in (ds.get("measured") or [])
                     if isinstance(x, list) and len(x) == 3)
    w = S.mapping(d.get("workload"), "workload", known=("how", "arrival", "lengths", "tenants", "runs"))
    ar = S.mapping(w.get("arrival") or {"process": "poisson"}, "workload.arrival",
                   known=("process", "cv", "path", "format"))
    proc = S.choice(ar.get("process", "poisson"), "workload.arrival.process", ("constant", "poisson", "gamma", "replay"))
    arrival = ArrivalSpec(proc, S.number(ar.get("cv", 1.0), "workload.arrival.cv", above=0.0),
                          ar.get("path"), str(ar.get("format", "auto")))
    lengths = LengthDist.from_dict(w.get("lengths") or {}, "workload.lengths")
    tenants = []
    for i, t in enumerate(w.get("tenants") or []):
        t = S.mapping(t, f"workload.tenants[{i}]", known=("name", "share", "slo_class", "lengths"))
        if not t.get("name"):
            raise SpecError(f"workload.tenants[{i}] needs a name", field=f"workload.tenants[{i}].name")
        tenants.append(Tenant(str(t["name"]), S.number(t.get("share", 1.0), f"workload.tenants[{i}].share", above=0.0),
                              None if t.get("slo_class") is None else str(t["slo_class"]),
                              LengthDist.from_dict(t["lengths"], f"workload.tenants[{i}].lengths")
                              if t.get("lengths") else None))
    runs = tuple(dict(r) for r in (w.get("runs") or []) if isinstance(r, dict))
    wl = Workload(arrival, lengths, tuple(tenants), runs, str(w.get("how", "") or ""))
    lc = d.get("last_check")
    notes = tuple(str(n) for n in (d.get("notes") or []))
    tw = Twin(name=str(d.get("name") or "twin"), params=params, decode=tuple(points),
              decode_how=str(ds.get("how", "") or ""), workload=wl, source=dict(d.get("fitted_from") or {}),
              notes=notes, last_check=lc if isinstance(lc, dict) else None, measured_decode=measured)
    # the simulation must accept it: build the replica once to surface range errors here
    tw.replica_params()
    return tw


def load_twin(path: str | os.PathLike) -> Twin:
    """Read twin.yaml (SpecError with the file, line and field on any problem)."""
    doc = S.document(Path(path).expanduser(), what="twin file",
                     fix="write one with `capplan twin fit STUDY --out twin.yaml` (docs/twin.md)")
    with doc.located():
        return twin_from_dict(doc.data)


def load_system(path: str | os.PathLike):
    """What runs are simulated on, from a file — the one loader for design, synth --design, the
    plan's dynamics and the timelines page: a twin (``format: capplan-twin/…``, written by
    ``capplan twin fit``) or else a synth configuration YAML (docs/synth.md)."""
    doc = S.load_yaml(path, what="twin or synth config",
                      fix="a twin.yaml written by `capplan twin fit`, or a synth config YAML (docs/synth.md)")
    if isinstance(doc.data, dict) and str(doc.data.get("format", "")).startswith("capplan-twin/"):
        return load_twin(path)
    from ..sim.config import load_config

    return load_config(path)


def record_check(path: str | os.PathLike, check: dict) -> Twin:
    """Store a check's verdict in the twin file (so every later use repeats a warning)."""
    tw = load_twin(path)
    tw = replace(tw, last_check=check)
    write_twin(tw, path)
    return tw
