"""Service-time model of one replica: how long one scheduler iteration takes.

An iteration runs every sequence of the batch once: decode sequences emit one token each and
prefill sequences compute a chunk of their prompt. Its time is

    iteration_ms = decode_step_ms(n_seqs) + [prefill_tokens > 0] * prefill_overhead_ms
                   + prefill_ms_per_token * prefill_tokens

``decode_step_ms(n)`` interpolates a profiled table linearly in n (linear extrapolation past the
last profiled batch size, from its last two points). The default is calibrated on the
Llama2-70B / H100-80GB / TP4 rows of splitwise-sim's ``splitwise_sim_perf_model.csv`` (MIT;
Patel et al., Splitwise, ISCA'24); :func:`fit_service_model` refits it from any CSV of that
format, so a user can calibrate on their own profile.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import spec as S
from ..errors import SpecError

PROFILE_COLUMNS = ("model", "hardware", "prompt_size", "batch_size", "prompt_time", "token_time",
                   "tensor_parallel")


@dataclass(frozen=True)
class ServiceModel:
    """Iteration-time model. Times in ms; batch sizes strictly increasing."""

    decode_batch: tuple[int, ...]
    decode_step_ms: tuple[float, ...]
    prefill_ms_per_token: float
    prefill_overhead_ms: float = 0.0
    source: str = ""

    def __post_init__(self):
        if len(self.decode_batch) == 0 or len(self.decode_batch) != len(self.decode_step_ms):
            raise SpecError("service model: decode_batch and decode_step_ms need the same, non-zero length",
                            field="service_model.decode_step_ms",
                            fix="e.g. decode_step_ms: {1: 29.4, 64: 52.0}")
        if any(b2 <= b1 for b1, b2 in zip(self.decode_batch, self.decode_batch[1:])) or self.decode_batch[0] < 1:
            raise SpecError("service model: decode batch sizes must be ≥ 1 and strictly increasing",
                            field="service_model.decode_step_ms")
        if any(not (v > 0) for v in self.decode_step_ms):
            raise SpecError("service model: decode step times must be > 0 ms",
                            field="service_model.decode_step_ms")
        if not (self.prefill_ms_per_token >= 0) or not (self.prefill_overhead_ms >= 0):
            raise SpecError("service model: prefill_ms_per_token and prefill_overhead_ms must be ≥ 0",
                            field="service_model.prefill_ms_per_token")

    def step_ms(self, n_seqs) -> np.ndarray | float:
        """Decode step time for ``n_seqs`` sequences in the batch (vectorised)."""
        b = np.asarray(self.decode_batch, dtype=float)
        v = np.asarray(self.decode_step_ms, dtype=float)
        n = np.asarray(n_seqs, dtype=float)
        out = np.interp(n, b, v)
        if len(b) >= 2:
            slope = (v[-1] - v[-2]) / (b[-1] - b[-2])
            out = np.where(n > b[-1], v[-1] + max(slope, 0.0) * (n - b[-1]), out)
        return out if out.ndim else float(out)

    def iteration_ms(self, n_seqs, prefill_tokens) -> np.ndarray | float:
        p = np.asarray(prefill_tokens, dtype=float)
        out = self.step_ms(n_seqs) + np.where(p > 0, self.prefill_overhead_ms, 0.0) + self.prefill_ms_per_token * p
        return out if np.ndim(out) else float(out)

    def step_table_ns(self, max_batch: int) -> list[int]:
        """Decode step in integer ns for n = 0..max_batch, rounded to whole µs (entry 0 unused)."""
        ms = self.step_ms(np.arange(max_batch + 1))
        return [int(round(float(x) * 1000.0)) * 1000 for x in ms]

    def to_dict(self) -> dict:
        return {
            "decode_step_ms": {int(b): round(float(v), 4) for b, v in zip(self.decode_batch, self.decode_step_ms)},
            "prefill_ms_per_token": round(float(self.prefill_ms_per_token), 6),
            "prefill_overhead_ms": round(float(self.prefill_overhead_ms), 4),
            "source": self.source,
        }

    @classmethod
    def from_dict(cls, d: dict, *, field_prefix: str = "replica.service_model") -> "ServiceModel":
        """A model from ``{decode_step_ms: {batch: ms}, prefill_ms_per_token, ...}``, checked
        with the spec kit."""
        f = field_prefix
        d = S.mapping(d, f, known=("decode_step_ms", "prefill_ms_per_token", "prefill_overhead_ms",
                                   "source"))
        steps = d.get("decode_step_ms")
        if not isinstance(steps, dict) or not steps:
            S.fail(S.join(f, "decode_step_ms"),
                   "service model needs decode_step_ms as a mapping batch size → ms",
                   "e.g. decode_step_ms: {1: 29.4, 64: 52.0}")
        fs = S.join(f, "decode_step_ms")
        items = sorted((S.number(k, S.join(fs, k), integer=True, minimum=1, text_ok=True),
                        S.number(v, S.join(fs, k), above=0.0)) for k, v in steps.items())
        return cls(tuple(b for b, _ in items), tuple(v for _, v in items),
                   S.number(d.get("prefill_ms_per_token", 0.0), S.join(f, "prefill_ms_per_token"),
                            minimum=0.0),
                   S.number(d.get("prefill_overhead_ms", 0.0), S.join(f, "prefill_overhead_ms"),
                            minimum=0.0),
                   str(d.get("source", "config")))


# Calibrated by fit_service_model(splitwise_sim_perf_model.csv, "llama2-70b", "h100-80gb", 4);
# tests/test_synth_service.py refits from the shared CSV and checks these constants.
DEFAULT_SERVICE_MODEL = ServiceModel(
    decode_batch=(1, 2, 4, 8, 16, 32, 64),
    decode_step_ms=(29.4062, 29.9921, 29.9841, 31.4136, 32.8364, 36.918, 51.9867),
    prefill_ms_per_token=0.105563,
    prefill_overhead_ms=0.0,
    source="splitwise-sim perf model: llama2-70b / h100-80gb / TP4 (fit_service_model)",
)


def fit_service_model(path: str | os.PathLike, model: str = "llama2-70b", hardware: str = "h100-80gb",
                      tp: int = 4) -> ServiceModel:
    """Fit a ServiceModel from a profile CSV in splitwise-sim's format.

    decode_step_ms(b) = mean ``token_time`` per ``batch_size``; then prefill cost by least
    squares (non-negative) of ``prompt_time − decode_step_ms(batch)`` on
    ``batch_size × prompt_size`` over the per-(prompt, batch) means, so that the 90 repeated
    512-token rows do not outweigh the other configurations.
    """
    import pandas as pd
    from scipy.optimize import nnls

    p = Path(path)
    if not p.is_file():
        raise SpecError("service-model profile CSV not found", file=str(p),
                        fix="give the path of a CSV with columns " + ", ".join(PROFILE_COLUMNS))
    try:
        df = pd.read_csv(p)
    except Exception as exc:  # pandas raises several parser errors
        raise SpecError(f"cannot read the profile CSV: {exc}", file=str(p)) from None
    missing = [c for c in PROFILE_COLUMNS if c not in df.columns]
    if missing:
        raise SpecError(f"profile CSV lacks column(s) {', '.join(missing)}", file=str(p),
                        field=missing[0], fix="columns needed: " + ", ".join(PROFILE_COLUMNS))
    sel = df[(df["model"].astype(str) == model) & (df["hardware"].astype(str) == hardware)
             & (df["tensor_parallel"] == tp)]
    if sel.empty:
        combos = sorted({f"{a}/{b}/TP{c}" for a, b, c in
                         df[["model", "hardware", "tensor_parallel"]].itertuples(index=False)})
        raise SpecError(f"no profile rows for {model}/{hardware}/TP{tp}", file=str(p), field="model",
                        fix="available: " + ", ".join(combos))
    g = sel.groupby("batch_size")["token_time"].mean().sort_index()
    batch = tuple(int(b) for b in g.index)
    steps = tuple(float(v) for v in g.values)
    base = ServiceModel(batch, steps, 0.0, 0.0)
    cfg = sel.groupby(["prompt_size", "batch_size"])["prompt_time"].mean().reset_index()
    x = (cfg["prompt_size"] * cfg["batch_size"]).to_numpy(float)
    y = cfg["prompt_time"].to_numpy(float) - base.step_ms(cfg["batch_size"].to_numpy(float))
    coef, _ = nnls(np.c_[np.ones_like(x), x], y)
    if not math.isfinite(coef[1]) or coef[1] <= 0:
        raise SpecError("profile CSV gives no positive prefill cost per token", file=str(p),
                        field="prompt_time")
    return ServiceModel(batch, tuple(round(s, 4) for s in steps), round(float(coef[1]), 6),
                        round(float(coef[0]), 4), f"{p.name}: {model} / {hardware} / TP{tp}")
