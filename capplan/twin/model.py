"""The twin: a frozen, printable description of a measured serving system as a capplan.sim
configuration, with every parameter's value, unit, how it was estimated and its uncertainty.

``Twin`` is what ``fit_twin`` returns and what ``twin.yaml`` holds (capplan/twin/twinfile.py
reads and writes it). The simulation uses only the values; the rest is for people and for the
parameter draws of ``twin check`` (docs/twin.md).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field, replace

import numpy as np

from ..sim.config import ArrivalSpec, FaultSpec, SynthConfig
from ..sim.engine import ReplicaParams
from ..sim.service import ServiceModel
from ..sim.sweep import generate_study
from .check import TwinCheck, check_twin
from .params import EDITED, ESTIMATED, DecodePoint, Param, Workload, notes_text
from .protocol import simulate_protocol

class TwinWarning(UserWarning):
    """A twin whose last check disagreed with its measured study is being used."""


@dataclass(frozen=True)
class Twin:
    """A calibrated twin. ``params`` holds the scalar parameters by key (see PARAM_KEYS),
    ``decode`` the decode-step curve; ``workload`` what the clients sent; ``source`` where it
    was fitted from; ``notes`` every fallback in words; ``last_check`` the latest
    ``twin check`` verdict (a twin that disagreed repeats the warning wherever it is used)."""

    name: str
    params: tuple[Param, ...]
    decode: tuple[DecodePoint, ...]
    decode_how: str
    workload: Workload
    source: dict = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    last_check: dict | None = None
    measured_decode: tuple[tuple[int, float, int], ...] = ()  # (batch, mean ms, iterations)

    # ---------------------------------------------------------------- parameter access
    def param(self, key: str) -> Param:
        for p in self.params:
            if p.key == key:
                return p
        raise KeyError(key)

    def value(self, key: str):
        return self.param(key).value

    def with_values(self, **values) -> "Twin":
        """A copy with parameter values changed (marked as edited)."""
        ps = []
        for p in self.params:
            if p.key in values:
                ps.append(replace(p, value=values.pop(p.key), source=EDITED))
            else:
                ps.append(p)
        if values:
            raise KeyError(", ".join(values))
        return replace(self, params=tuple(ps))

    def scaled(self, *, decode: float = 1.0, prefill: float = 1.0) -> "Twin":
        """Service times multiplied: ``decode=1.3`` makes every decode step 30 % slower."""
        dec = tuple(replace(d, ms=d.ms * decode) for d in self.decode)
        tw = replace(self, decode=dec)
        if prefill != 1.0:
            tw = tw.with_values(prefill_ms_per_token=float(self.value("prefill_ms_per_token")) * prefill,
                                prefill_overhead_ms=float(self.value("prefill_overhead_ms")) * prefill)
        if decode != 1.0:
            tw = replace(tw, notes=tw.notes + (f"decode steps scaled by {decode:g} by hand",))
        return tw

    @property
    def edited(self) -> tuple[str, ...]:
        """Parameters whose value differs from what the fit gave."""
        out = [p.key for p in self.params if p.fitted is not None and p.value != p.fitted]
        out += [f"decode_step_ms[{d.batch}]" for d in self.decode if d.fitted is not None
                and abs(d.ms - d.fitted) > 1e-9]
        return tuple(out)

    @property
    def warning(self) -> str:
        """The warning every use of this twin repeats ('' when its last check agreed)."""
        lc = self.last_check or {}
        if lc.get("verdict") == "disagrees":
            return (f"WARNING: this twin DISAGREED with the measured study {lc.get('study', '?')} at its last "
                    f"check ({lc.get('where', 'see the check report')}); treat what it predicts with care.")
        return ""

    # ---------------------------------------------------------------- simulation
    @property
    def service(self) -> ServiceModel:
        return ServiceModel(tuple(int(d.batch) for d in self.decode), tuple(float(d.ms) for d in self.decode),
                            float(self.value("prefill_ms_per_token")), float(self.value("prefill_overhead_ms")),
                            f"capplan twin: {self.name}")

    def replica_params(self) -> ReplicaParams:
        bs = int(self.value("kv_block_size"))
        wm = float(self.value("kv_watermark"))
        kv_tokens = int(self.value("kv_capacity_tokens"))
        mb = int(self.value("max_batch"))
        kv_blocks = max(1, int(np.ceil(kv_tokens / bs / max(1e-9, 1.0 - wm))))
        mml = int(self.value("max_model_len"))
        mml = min(mml, int(kv_blocks * (1.0 - wm)) * bs)
        ql = self.value("queue_limit")
        return ReplicaParams(max_batch=mb, token_budget=max(int(self.value("token_budget")), mb),
                             kv_blocks=kv_blocks, block_size=bs, kv_watermark=wm, max_model_len=mml,
                             queue_limit=None if ql is None else int(ql), service=self.service,
                             prefill=str(self.value("prefill_mode")),
                             prefill_lanes=None if self.value("prefill_lanes") is None
                             else int(self.value("prefill_lanes")),
                             prefill_jitter_cv=float(self.value("prefill_jitter_cv"))
                             if self.value("prefill_mode") == "separate" else 0.0)

    @property
    def replicas(self) -> int:
        return int(self.value("replicas"))

    @property
    def timeout_s(self) -> float:
        return float(self.value("client_timeout_s"))

    @property
    def faults(self) -> FaultSpec:
        return FaultSpec(float(self.value("error_share")), float(self.value("stall_share")))

    def synth_config(self, *, rates=None, duration_s: float | None = None, warmup_s: float | None = None,
                     repeats: int = 1, seed: int = 0, itl: bool = True, name: str | None = None) -> SynthConfig:
        """This twin as a capplan.sim configuration (so ``generate_study``, ``simulate_level``
        and ``true_attainment`` run it). Rates, duration and warm-up default to the measured
        study's runs (median duration and warm-up). A twin whose last check disagreed warns
        (TwinWarning) here, where every simulation of it starts."""
        if self.warning:
            warnings.warn(self.warning, TwinWarning, stacklevel=2)
        per = self.workload.per_run
        if rates is None:
            rates = tuple(float(r["offered_rps"]) for r in per if r.get("offered_rps")) or (1.0,)
        durs = [float(r["duration_s"]) for r in per if r.get("duration_s")]
        warms = [float(r.get("warmup_s") or 0.0) for r in per]
        dur = float(duration_s if duration_s is not None else (np.median(durs) if durs else 300.0))
        warm = float(warmup_s if warmup_s is not None else (np.median(warms) if warms else 0.0))
        if warm >= dur:
            warm = 0.0
        sysd = dict(self.source.get("system") or {})
        sysd = {"gpu": str(sysd.get("gpu", "unknown")), "gpus_per_replica": int(sysd.get("gpus_per_replica", 1) or 1),
                "tp": int(sysd.get("tp", 1) or 1), "pp": int(sysd.get("pp", 1) or 1), "replicas": self.replicas,
                "engine": f"capplan twin ({self.value('prefill_mode')} prefill)",
                "model": str(sysd.get("model", "unknown"))}
        faults = self.faults
        return SynthConfig(
            name=name or self.name, description=f"Simulated by the capplan twin {self.name!r}.", seed=int(seed),
            system=sysd, replicas=self.replicas, replica=self.replica_params(), timeout_s=self.timeout_s,
            drain_s=None, arrival=self.workload.arrival, lengths=self.workload.lengths,
            tenants=self.workload.tenants, power=None, itl=itl, load_model="open",
            rates=tuple(float(r) for r in rates), duration_s=dur, warmup_s=warm, repeats=int(repeats),
            faults=faults if faults.any else None)

    def draw(self, rng: np.random.Generator) -> "Twin":
        """One draw of the service parameters from their uncertainty (normal with the sd
        implied by each 95 % interval; the decode curve shifts by one common z so its shape is
        kept). Limits and the workload stay as they are. Used by ``twin check``."""
        z = rng.standard_normal(3)
        dec = []
        for d in self.decode:
            sd = 0.0 if d.ci95 is None else (d.ci95[1] - d.ci95[0]) / (2 * 1.959964)
            dec.append(replace(d, ms=max(1e-3, d.ms + z[0] * sd)))
        ps = []
        for p in self.params:
            if p.key == "prefill_ms_per_token" and p.sd:
                p = replace(p, value=max(0.0, float(p.value) + z[1] * p.sd))
            elif p.key == "prefill_overhead_ms" and p.sd:
                p = replace(p, value=max(0.0, float(p.value) + z[2] * p.sd))
            ps.append(p)
        return replace(self, decode=tuple(dec), params=tuple(ps))

    def simulate(self, *, rates, duration_s: float, warmup_s: float = 0.0, repeats: int = 1, seed: int = 0,
                 arrival="poisson", itl: bool = False, out=None, workers: int | None = None):
        """Run a load-test protocol on the twin. Without ``out``: the runs in memory
        (:func:`capplan.twin.protocol.simulate_protocol`, a tuple of SimRun). With ``out``: an
        ordinary study written there (returns its path), whose manifest records this twin."""
        if out is None:
            return simulate_protocol(self, rates=rates, duration_s=duration_s, warmup_s=warmup_s, repeats=repeats,
                                     seed=seed, arrival=arrival, itl=itl, workers=workers)
        cfg = self.synth_config(rates=rates, duration_s=duration_s, warmup_s=warmup_s, repeats=repeats, seed=seed,
                                itl=True)
        if arrival == "poisson":
            cfg = replace(cfg, arrival=ArrivalSpec("poisson"))
        elif isinstance(arrival, ArrivalSpec):
            cfg = replace(cfg, arrival=arrival)
        rec = {"name": self.name, "fitted_from": {k: self.source.get(k) for k in ("study", "sha256")},
               "last_check": self.last_check, "edited": list(self.edited)}
        path, _ = generate_study(cfg, out, workers=workers, manifest_extra={"twin": rec},
                                 readme_extra=("\n" + self.warning) if self.warning else "")
        return path

    def check(self, study, slo, **kw) -> TwinCheck:
        """Replay ``study``'s runs through this twin and compare (capplan.twin.check)."""
        return check_twin(self, study, slo, **kw)

    # ---------------------------------------------------------------- presentation
    def to_frame(self):
        import pandas as pd

        rows = []
        for d in self.decode:
            rows.append({"parameter": f"decode step at batch {d.batch}", "value": round(d.ms, 4), "unit": "ms",
                         "ci95_low": d.ci95[0] if d.ci95 else None, "ci95_high": d.ci95[1] if d.ci95 else None,
                         "source": ESTIMATED if d.fitted is None or abs(d.ms - d.fitted) < 1e-9 else EDITED,
                         "how": self.decode_how})
        for p in self.params:
            rows.append({"parameter": p.key.replace("_", " "), "value": p.value, "unit": p.unit,
                         "ci95_low": p.ci95[0] if p.ci95 else None, "ci95_high": p.ci95[1] if p.ci95 else None,
                         "source": p.source, "how": p.how})
        return pd.DataFrame(rows)

    def display_frame(self):
        """to_frame() for people: readable headers, blanks for missing intervals."""
        df = self.to_frame().rename(columns={"parameter": "Parameter", "value": "Value", "unit": "Unit",
                                             "ci95_low": "95 % low", "ci95_high": "95 % high",
                                             "source": "Source", "how": "How it was estimated"})
        df["Value"] = df["Value"].map(lambda v: "none" if v is None else v).astype(object)
        return df.astype(object).where(df.notna(), "")

    def to_text(self) -> str:
        src = self.source
        lines = [f"Twin {self.name!r}" + (f" fitted from {src.get('study')} ({src.get('requests', '?')} requests, "
                                           f"{len(src.get('runs', []))} runs; {src.get('method', '')})" if src else "")]
        if self.warning:
            lines.append(self.warning)
        lines.append("")
        lines.append(f"{'parameter':<34} {'value':>14} {'unit':<12} {'95 % interval':<24} source")
        for d in self.decode:
            ci = f"[{d.ci95[0]:.4g}, {d.ci95[1]:.4g}]" if d.ci95 else ""
            lines.append(f"{'decode step, batch ' + str(d.batch):<34} {d.ms:>14.4g} {'ms':<12} {ci:<24} estimated")
        for p in self.params:
            v = p.value
            vs = "none" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))
            ci = f"[{p.ci95[0]:.4g}, {p.ci95[1]:.4g}]" if p.ci95 else ""
            lines.append(f"{p.key.replace('_', ' '):<34} {vs:>14} {p.unit:<12} {ci:<24} {p.source}")
        wl = self.workload
        lines.append("")
        arr = wl.arrival
        lines.append(f"workload: {arr.process} arrivals" + (f" (CV {arr.cv:.2f})" if arr.process == "gamma" else "")
                     + (f"; tenants " + ", ".join(f"{t.name} {t.share:.0%}" for t in wl.tenants) if wl.tenants else "")
                     + f"; input tokens median {wl.lengths.input.median:.0f}, output median {wl.lengths.output.median:.0f}")
        if self.edited:
            lines.append("edited by hand: " + ", ".join(self.edited))
        lines += notes_text(self.notes)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.to_text()

    def figure(self):
        """The decode-step curve over the measured per-batch means."""
        import plotly.graph_objects as go

        fig = go.Figure()
        if self.measured_decode:
            b, ms, cnt = zip(*self.measured_decode)
            fig.add_trace(go.Scatter(x=b, y=ms, mode="markers", name="measured (mean per batch size)",
                                     marker=dict(size=[4 + 6 * min(1.0, c / 500) for c in cnt], opacity=0.6),
                                     text=[f"{c} iterations" for c in cnt]))
        xb = np.arange(1, max([d.batch for d in self.decode] + [2]) + 1)
        fig.add_trace(go.Scatter(x=xb, y=self.service.step_ms(xb), mode="lines", name="twin"))
        lo = [d.ci95[0] if d.ci95 else d.ms for d in self.decode]
        hi = [d.ci95[1] if d.ci95 else d.ms for d in self.decode]
        fig.add_trace(go.Scatter(x=[d.batch for d in self.decode], y=hi, mode="lines", line=dict(width=0),
                                 showlegend=False, hoverinfo="skip"))
        fig.add_trace(go.Scatter(x=[d.batch for d in self.decode], y=lo, mode="lines", line=dict(width=0),
                                 fill="tonexty", name="95 % interval", hoverinfo="skip"))
        fig.update_layout(title=f"Decode step vs running batch — {self.name}", xaxis_title="sequences decoding",
                          yaxis_title="ms per decode step", template="plotly_white")
        return fig
