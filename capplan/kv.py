"""The KV-memory bound of a replica: how many sequences of a given context length fit in the
memory left after the weights and a stated activation reserve (docs/mix.md, "KV memory").

A replica that is out of KV cache cannot admit another sequence however idle its compute is,
so a capacity measured at short contexts does not hold at long ones. The arithmetic, per
replica of ``g`` GPUs (tensor × pipeline parallel), is the one vLLM uses to size its cache:

- KV bytes per token      = 2 (K and V) × layers × KV heads × head dim × bytes per value
- weight bytes            = parameters × bytes per parameter
- memory for weights + KV = g × GPU memory × (1 − activation reserve)
- KV memory               = that − weight bytes
- KV tokens               = ⌊KV memory / KV bytes per token⌋
- max sequences at L      = ⌊KV tokens / (⌈L / block⌉ × block)⌋ (paged cache: whole blocks)

The model and GPU numbers come from a small catalogue (``templates/catalogue.yaml``: public
model configs and GPU datasheets, each with its source); a catalogue of one's own, or numbers
given directly, work the same way. Only grouped-query / multi-head attention is modelled.
"""

from __future__ import annotations

import functools
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from . import spec as S
from .errors import SpecError

GIB = 1024 ** 3
DEFAULT_RESERVE = 0.10  # fraction of each GPU's memory kept for activations, CUDA graphs, runtime
DEFAULT_BLOCK_TOKENS = 16  # vLLM's default KV block size
CATALOGUE_NAME = "templates/catalogue.yaml"
#: bytes per KV value by cache dtype (vLLM's --kv-cache-dtype; "auto" means the model's bf16)
DEFAULT_KV_DTYPES = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "fp32": 4.0}


@dataclass(frozen=True)
class ModelInfo:
    """The attention shape and size of a model (numbers from its public config)."""

    name: str
    layers: int
    kv_heads: int
    head_dim: int
    params_b: float  # billions of parameters (all resident, MoE experts included)
    source: str = ""

    def kv_bytes_per_token(self, value_bytes: float) -> float:
        """2 (K and V) × layers × KV heads × head dim × bytes per value."""
        return 2.0 * self.layers * self.kv_heads * self.head_dim * float(value_bytes)


@dataclass(frozen=True)
class GPUInfo:
    """Memory and peak board power of a GPU (vendor datasheet)."""

    name: str
    memory_gib: float
    peak_power_w: float | None = None
    source: str = ""


@dataclass(frozen=True)
class Catalogue:
    """Models, GPUs and KV dtypes by name; look-ups ignore case and punctuation, so
    ``Llama2-70B`` finds ``llama-2-70b`` and ``H100-80GB`` finds ``h100-80gb``."""

    models: dict = field(default_factory=dict)
    gpus: dict = field(default_factory=dict)
    kv_dtypes: dict = field(default_factory=lambda: dict(DEFAULT_KV_DTYPES))
    file: str | None = None

    def model(self, name: str, field_: str = "model.name") -> ModelInfo:
        return _find(self.models, name, field_, "model", self.file)

    def gpu(self, name: str, field_: str = "model.gpu") -> GPUInfo:
        return _find(self.gpus, name, field_, "GPU", self.file)

    def dtype_bytes(self, dtype: str, field_: str = "model.kv_dtype") -> float:
        key = str(dtype).lower()
        if key == "auto":
            key = "bf16"
        if key not in self.kv_dtypes:
            near = S.did_you_mean(key, self.kv_dtypes)
            S.fail(field_, f"unknown KV dtype {dtype!r}" + (f" (did you mean {near!r}?)" if near else ""),
                   "use one of: " + ", ".join(self.kv_dtypes))
        return float(self.kv_dtypes[key])

    def has_model(self, name: str | None) -> bool:
        return name is not None and _norm(name) in {_norm(k) for k in self.models}

    def has_gpu(self, name: str | None) -> bool:
        return name is not None and _norm(name) in {_norm(k) for k in self.gpus}

    def to_frame(self, kind: str = "model"):
        """The catalogue's models (``kind="model"``) or GPUs (``kind="gpu"``) as a table."""
        import pandas as pd

        if kind == "gpu":
            return pd.DataFrame([{"name": g.name, "memory_gib": g.memory_gib,
                                  "peak_power_w": g.peak_power_w, "source": g.source}
                                 for g in self.gpus.values()],
                                columns=["name", "memory_gib", "peak_power_w", "source"])
        return pd.DataFrame([{"name": m.name, "layers": m.layers, "kv_heads": m.kv_heads,
                              "head_dim": m.head_dim, "params_b": m.params_b,
                              "kv_bytes_per_token_bf16": m.kv_bytes_per_token(2), "source": m.source}
                             for m in self.models.values()],
                            columns=["name", "layers", "kv_heads", "head_dim", "params_b",
                                     "kv_bytes_per_token_bf16", "source"])


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9.]", "", str(name).lower())


def _find(table: dict, name: str, field_: str, what: str, file: str | None):
    want = _norm(name)
    for k, v in table.items():
        if _norm(k) == want:
            return v
    near = S.did_you_mean(name, table)
    raise SpecError(f"{what} {name!r} is not in the catalogue" + (f" (did you mean {near!r}?)" if near else ""),
                    field=field_, file=file,
                    fix=f"use one of: {', '.join(table)}; or add it to a catalogue of your own "
                        f"(copy {CATALOGUE_NAME}) and pass that")


def default_catalogue_path() -> Path:
    """``templates/catalogue.yaml`` beside the package (editable install) or inside it."""
    pkg = Path(__file__).resolve().parent
    for base in (pkg, pkg.parent):
        p = base / CATALOGUE_NAME
        if p.is_file():
            return p
    raise SpecError(f"the model/GPU catalogue {CATALOGUE_NAME} is missing next to the capplan package",
                    fix="install capplan from its repository (pip install -e .) or pass a catalogue file")


_MODEL_KEYS = ("layers", "kv_heads", "head_dim", "params_b", "source")
_GPU_KEYS = ("memory_gib", "peak_power_w", "source")


def load_catalogue(path: str | os.PathLike | None = None) -> Catalogue:
    """Read and check a catalogue (default ``templates/catalogue.yaml``); cached by file and
    modification time, so plans re-made on every what-if slider move do not re-read it."""
    p = default_catalogue_path() if path is None else Path(path)
    try:
        stamp = p.stat().st_mtime_ns
    except OSError:
        stamp = None
    return _load_catalogue(str(p), stamp)


@functools.lru_cache(maxsize=8)
def _load_catalogue(path: str, _stamp) -> Catalogue:
    p = Path(path)
    doc = S.document(p, what="model/GPU catalogue", fix=f"start from {CATALOGUE_NAME}")
    with doc.located():
        raw = S.mapping(doc.data, "", known=("models", "gpus", "kv_dtypes"), what="catalogue",
                        optional=False, example="models: {...}, gpus: {...}")
        models, gpus, dtypes = {}, {}, dict(DEFAULT_KV_DTYPES)
        for name, d in S.mapping(raw.get("models"), "models").items():
            f = S.join("models", name)
            d = S.mapping(d, f, known=_MODEL_KEYS, optional=False)
            models[str(name)] = ModelInfo(
                name=str(name),
                layers=S.number(d.get("layers"), S.join(f, "layers"), integer=True, minimum=1, example="80"),
                kv_heads=S.number(d.get("kv_heads"), S.join(f, "kv_heads"), integer=True, minimum=1, example="8"),
                head_dim=S.number(d.get("head_dim"), S.join(f, "head_dim"), integer=True, minimum=1, example="128"),
                params_b=S.number(d.get("params_b"), S.join(f, "params_b"), above=0.0, example="70.6"),
                source=S.text(d.get("source"), S.join(f, "source")) or "")
        for name, d in S.mapping(raw.get("gpus"), "gpus").items():
            f = S.join("gpus", name)
            d = S.mapping(d, f, known=_GPU_KEYS, optional=False)
            gpus[str(name)] = GPUInfo(
                name=str(name),
                memory_gib=S.number(d.get("memory_gib"), S.join(f, "memory_gib"), above=0.0, example="80"),
                peak_power_w=S.number(d.get("peak_power_w"), S.join(f, "peak_power_w"), above=0.0,
                                      optional=True, example="700"),
                source=S.text(d.get("source"), S.join(f, "source")) or "")
        for name, b in S.mapping(raw.get("kv_dtypes"), "kv_dtypes").items():
            dtypes[str(name).lower()] = S.number(b, S.join("kv_dtypes", name), above=0.0, example="2")
    return Catalogue(models=models, gpus=gpus, kv_dtypes=dtypes, file=str(p))


# ----------------------------------------------------------------------------- the budget


@dataclass(frozen=True)
class KVBudget:
    """KV memory of one replica and how many sequences of ``context_tokens`` it holds."""

    model: ModelInfo
    gpu: GPUInfo
    gpus: int
    kv_dtype: str
    kv_value_bytes: float
    weight_bytes_per_param: float
    activation_reserve: float
    context_tokens: int
    block_tokens: int
    kv_bytes_per_token: float
    weight_bytes: float
    memory_bytes: float
    usable_bytes: float
    kv_bytes: float
    kv_tokens: int
    tokens_per_sequence: int
    max_sequences: int
    notes: tuple[str, ...] = ()

    @property
    def weights_fit(self) -> bool:
        return self.kv_bytes > 0

    def max_sequences_at(self, context_tokens: float) -> int:
        """Sequences of ``context_tokens`` (whole blocks) that fit in the KV memory."""
        per = _blocks(context_tokens, self.block_tokens)
        return int(self.kv_tokens // per) if per > 0 and self.kv_tokens > 0 else 0

    def items(self) -> list[tuple]:
        """(key, name, value, unit, formula, inputs) rows — the plan's KV line items."""
        m, g = self.model, self.gpu
        return [
            ("kv_bytes_per_token", "KV cache per token", self.kv_bytes_per_token, "bytes",
             "2 (K and V) × layers × KV heads × head dim × bytes per value",
             {"model": m.name, "layers": m.layers, "kv_heads": m.kv_heads, "head_dim": m.head_dim,
              "kv_dtype": self.kv_dtype, "bytes_per_value": self.kv_value_bytes}),
            ("weight_gib_per_replica", "model weights per replica", self.weight_bytes / GIB, "GiB",
             "parameters × bytes per parameter / 2³⁰ (spread over the replica's GPUs)",
             {"params_b": m.params_b, "bytes_per_param": self.weight_bytes_per_param}),
            ("memory_gib_per_replica", "GPU memory per replica for weights and KV", self.usable_bytes / GIB, "GiB",
             "GPUs per replica × GPU memory × (1 − activation reserve)",
             {"gpus": self.gpus, "gpu": g.name, "memory_gib": g.memory_gib,
              "activation_reserve": self.activation_reserve}),
            ("kv_gib_per_replica", "KV memory per replica", self.kv_bytes / GIB, "GiB",
             "memory for weights and KV − weights", {"usable_gib": self.usable_bytes / GIB,
                                                     "weights_gib": self.weight_bytes / GIB}),
            ("kv_tokens_per_replica", "KV cache capacity per replica", float(self.kv_tokens), "tokens",
             "⌊KV memory / KV cache per token⌋", {"kv_bytes": self.kv_bytes,
                                                   "kv_bytes_per_token": self.kv_bytes_per_token}),
            ("kv_max_sequences", f"max concurrent sequences at {self.context_tokens:,} tokens of context",
             float(self.max_sequences), "sequences",
             "⌊KV tokens / (⌈context / block⌉ × block)⌋ (the paged cache holds whole blocks)",
             {"kv_tokens": self.kv_tokens, "context_tokens": self.context_tokens,
              "block_tokens": self.block_tokens}),
        ]

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame([{"item": n, "value": v, "unit": u, "formula": f,
                              "inputs": "; ".join(f"{k} = {x}" for k, x in i.items()), "key": k0}
                             for k0, n, v, u, f, i in self.items()],
                            columns=["item", "value", "unit", "formula", "inputs", "key"])

    def to_text(self) -> str:
        head = (f"{self.model.name} on {self.gpus} × {self.gpu.name} ({self.kv_dtype} KV cache, "
                f"{self.activation_reserve:.0%} of GPU memory kept for activations and runtime)")
        out = [head]
        for _, n, v, u, f, _ in self.items():
            out.append(f"  {n:<50} {_fmt(v):>14} {u:<9} = {f}")
        out += [f"  note: {n}" for n in self.notes]
        out += ["", f"  model: {self.model.source}", f"  GPU:   {self.gpu.source}"]
        return "\n".join(out)

    def figure(self):
        """Max concurrent sequences against context length (log axis)."""
        import numpy as np
        import plotly.graph_objects as go

        ctx = np.unique(np.geomspace(256, max(131072, 2 * self.context_tokens), 60).astype(int))
        seqs = [self.max_sequences_at(c) for c in ctx]
        fig = go.Figure(go.Scatter(x=ctx, y=seqs, mode="lines", name="max sequences"))
        fig.add_vline(x=self.context_tokens, line_dash="dash",
                      annotation_text=f"{self.context_tokens:,} tokens: {self.max_sequences} sequences")
        fig.update_layout(title=f"KV-cache bound — {self.model.name} on {self.gpus} × {self.gpu.name}",
                          xaxis_title="context length per sequence (tokens)", xaxis_type="log",
                          yaxis_title="max concurrent sequences per replica", template="plotly_white")
        return fig


def _blocks(tokens: float, block: int) -> int:
    return int(math.ceil(float(tokens) / block) * block)


def _fmt(v: float) -> str:
    return f"{v:,.0f}" if float(v).is_integer() or abs(v) >= 1e4 else f"{v:,.4g}"


def kv_budget(model: str | ModelInfo, gpu: str | GPUInfo, gpus: int, *, context_tokens: float,
              kv_dtype: str = "bf16", weight_bytes_per_param: float = 2.0,
              activation_reserve: float = DEFAULT_RESERVE, block_tokens: int = DEFAULT_BLOCK_TOKENS,
              catalogue: Catalogue | str | os.PathLike | None = None) -> KVBudget:
    """The KV budget of a replica of ``gpus`` GPUs (module docstring). ``model``/``gpu`` are
    catalogue names or ``ModelInfo``/``GPUInfo``; ``activation_reserve`` is the fraction of each
    GPU's memory kept for activations, CUDA graphs and the runtime (vLLM keeps 10 % by default:
    gpu_memory_utilization 0.9)."""
    cat = catalogue if isinstance(catalogue, Catalogue) else (
        load_catalogue(catalogue) if catalogue is not None or isinstance(model, str) or isinstance(gpu, str)
        else Catalogue())
    m = model if isinstance(model, ModelInfo) else cat.model(model)
    g = gpu if isinstance(gpu, GPUInfo) else cat.gpu(gpu)
    n_gpu = S.number(gpus, "model.gpus", integer=True, minimum=1, example="4")
    ctx = S.number(context_tokens, "model.context_tokens", integer=True, minimum=1, example="8192")
    res = S.number(activation_reserve, "model.activation_reserve", minimum=0.0, below=1.0, example="0.1")
    wb = S.number(weight_bytes_per_param, "model.weight_bytes_per_param", above=0.0, example="2")
    blk = S.number(block_tokens, "model.block_tokens", integer=True, minimum=1, example="16")
    vb = cat.dtype_bytes(kv_dtype)
    per_token = m.kv_bytes_per_token(vb)
    weights = m.params_b * 1e9 * wb
    memory = n_gpu * g.memory_gib * GIB
    usable = memory * (1.0 - res)
    kv = usable - weights
    notes = []
    if kv <= 0:
        notes.append(f"the weights ({weights / GIB:,.1f} GiB) do not fit in {usable / GIB:,.1f} GiB "
                     f"({n_gpu} × {g.memory_gib:g} GiB less the {res:.0%} reserve): use more GPUs per "
                     "replica or smaller weights (e.g. 8-bit)")
    kv_tokens = int(kv // per_token) if kv > 0 else 0
    per_seq = _blocks(ctx, blk)
    return KVBudget(model=m, gpu=g, gpus=n_gpu, kv_dtype=str(kv_dtype), kv_value_bytes=vb,
                    weight_bytes_per_param=wb, activation_reserve=res, context_tokens=ctx,
                    block_tokens=blk, kv_bytes_per_token=per_token, weight_bytes=weights,
                    memory_bytes=memory, usable_bytes=usable, kv_bytes=max(kv, 0.0),
                    kv_tokens=kv_tokens, tokens_per_sequence=per_seq,
                    max_sequences=int(kv_tokens // per_seq) if kv_tokens else 0, notes=tuple(notes))


@dataclass(frozen=True)
class KVBoundCheck:
    """Is the replica KV-bound before it is compute-bound at the forecast context length?

    Serving C_SLO per replica keeps ``needed_sequences`` = C_SLO × mean time in the system
    (Little's law) sequences in flight; the cache holds ``max_sequences`` at the forecast
    context. When it holds fewer, memory binds first and the rate a replica can serve is at
    most ``kv_bound_rps`` = max_sequences / mean time in the system."""

    capacity_rps: float
    mean_e2e_s: float
    needed_sequences: float
    max_sequences: int
    context_tokens: int
    source: str

    @property
    def kv_bound(self) -> bool:
        return self.max_sequences < self.needed_sequences

    @property
    def kv_bound_rps(self) -> float:
        return self.max_sequences / self.mean_e2e_s if self.mean_e2e_s > 0 else math.inf

    def sentence(self) -> str:
        head = (f"at {self.context_tokens:,} tokens of context a replica's KV cache holds "
                f"{self.max_sequences} sequences; serving C_SLO {self.capacity_rps:.4g} req/s per replica "
                f"keeps ≈ {self.needed_sequences:.1f} in flight (Little's law: C_SLO × mean time in "
                f"system {self.mean_e2e_s:.3g} s, {self.source})")
        if self.kv_bound:
            return (head + f" — KV-bound before compute-bound: at most ≈ {self.kv_bound_rps:.3g} req/s "
                    "per replica at this context; the study's C_SLO does not hold (test at this "
                    "context length, or plan with more GPUs per replica or an fp8 KV cache)")
        return head + " — compute binds first"


def kv_bound_check(budget: KVBudget, capacity_rps: float, mean_e2e_s: float, source: str) -> KVBoundCheck:
    """Compare the sequences a replica must hold at C_SLO with what its KV cache holds."""
    return KVBoundCheck(capacity_rps=float(capacity_rps), mean_e2e_s=float(mean_e2e_s),
                        needed_sequences=float(capacity_rps) * float(mean_e2e_s),
                        max_sequences=budget.max_sequences, context_tokens=budget.context_tokens,
                        source=source)
